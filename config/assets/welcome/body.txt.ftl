Hi ${customer.firstName!"there"},

Welcome aboard. Your account is ready.
<#if plan??>
You are on the ${plan?cap_first} plan.
</#if>

Get started: https://example.com/start?utm_campaign=welcome
Your preferences: ${preferencesUrl}
