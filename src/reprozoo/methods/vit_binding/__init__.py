"""Binding information in Vision Transformers: [CLS] vs spatial-token probes on colour x shape scenes."""
