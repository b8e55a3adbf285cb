Hi ${customer.firstName!"there"},

You signed up a couple of days ago but have not had a look around yet. It takes two minutes.

Take the tour: https://example.com/start?utm_campaign=reminder
<#-- Marketing mail ends with a link to the customer's preferences page, added when it is sent. -->
