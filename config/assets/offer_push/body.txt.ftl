${customer.firstName!"Hey"}, take ${discount!"10"}% off<#if product??> ${product}</#if> until ${until!"Sunday"}.
