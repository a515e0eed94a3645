"""FlashSchNet (IO-aware SchNet for GNN molecular dynamics), CPU miniature."""
