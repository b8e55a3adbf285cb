<!doctype html>
<html>
<body>
<p>Hi ${customer.firstName!"there"},</p>
<p>You signed up a couple of days ago but have not had a look around yet. It takes two minutes.</p>
<p><a href="https://example.com/start?utm_campaign=reminder">Take the tour</a></p>
<p><a href="https://example.com/preferences?s=${(customer._subscriptionId)!""}">Your preferences</a></p>
</body>
</html>
