<!doctype html>
<html>
<body>
<p>Hi ${customer.firstName!"there"},</p>
<p>Welcome aboard. Your account is ready.</p>
<#if plan??>
<p>You are on the <strong>${plan?cap_first}</strong> plan.</p>
</#if>
<p><a href="https://example.com/start?utm_campaign=welcome">Get started</a></p>
<p><a href="${preferencesUrl}">Your preferences</a></p>
</body>
</html>
