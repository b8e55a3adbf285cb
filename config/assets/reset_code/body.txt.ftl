<#-- One SMS segment: keep it short. `code` is a root key of the send_sms command. -->
Hi ${customer.firstName!"there"}, your reset code is ${code}. It expires in ${minutes!"10"} minutes.
