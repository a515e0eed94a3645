"""Dynamic regret of discounted FTRL via the discounted-to-dynamic reduction (Xie et al., ICML 2026)."""
