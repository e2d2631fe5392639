"""The KV cache and prefix cache: device pages and state slots, their manager, GDN snapshots, the host and disk
tiers and the staging ring between them."""
