"""Prime attention: channel-token attention with per-pair (relation-specific) filters on keys and values."""
