Hi ${customer.firstName!"there"}, here is what happened this week.

<#if items?has_content>
<#list items as item>
${item?counter}. ${item.title}: ${item.url}
</#list>
<#else>
A quiet week: nothing new.
</#if>

<#-- Marketing mail ends with a link to the customer's preferences page, added when it is sent. -->
