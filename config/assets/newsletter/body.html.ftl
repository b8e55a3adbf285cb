<!doctype html>
<html>
<body>
<p>Hi ${customer.firstName!"there"}, here is what happened this week.</p>
<#if items?has_content>
<ul>
<#list items as item>
  <li><a href="${item.url}">${item.title}</a><#if item.summary??> - ${item.summary}</#if></li>
</#list>
</ul>
<#else>
<p>A quiet week: nothing new.</p>
</#if>
<#-- Marketing mail ends with a link to the customer's preferences page, added when it is sent. -->
</body>
</html>
