"""EvoDiverse: parallel-tempering evolutionary hypothesis search (equation discovery, circle packing)."""
