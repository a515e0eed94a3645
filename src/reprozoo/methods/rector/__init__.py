"""RECTOR: masked region-channel-temporal modelling for EEG (hierarchical attention, adaptive partitions)."""
