"""Delivery of commands: the outbox, the dispatcher and the channels (email over SMTP)."""
