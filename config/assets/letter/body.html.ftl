<!doctype html>
<html>
<body>
<address>
${customer.firstName!""} ${customer.lastName!""}<br>
<#if (customer.address)??>
${customer.address.street!""}<br>
${customer.address.postalCode!""} ${customer.address.city!""}<br>
${customer.address.country!""}
</#if>
</address>
<p>Dear ${customer.firstName!"customer"},</p>
<p>${message!"Thank you for being with us."}</p>
<p>Kind regards,<br>The Mallard team</p>
</body>
</html>
