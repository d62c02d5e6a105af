"""Who may call the gateway: virtual keys, their rate limits and budgets."""
