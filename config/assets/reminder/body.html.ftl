<!doctype html>
<html>
<body>
<p>Hi ${customer.firstName!"there"},</p>
<p>You signed up a couple of days ago but have not had a look around yet. It takes two minutes.</p>
<p><a href="https://example.com/start?utm_campaign=reminder">Take the tour</a></p>
<#-- Marketing mail ends with a link to the customer's preferences page, added when it is sent. -->
</body>
</html>
