Hi ${customer.firstName!"there"}, here is what happened this week.

<#if items?has_content>
<#list items as item>
${item?counter}. ${item.title}: ${item.url}
</#list>
<#else>
A quiet week: nothing new.
</#if>

Manage preferences: https://example.com/preferences?s=${(customer._subscriptionId)!""}&utm_campaign=newsletter
