"""AFR-Net: adaptive flow routing over structural connectivity, fused with functional connectivity."""
