"""heavytail_rnn: Dale RNNs whose magnitudes are kept heavy-tailed by an optimal-transport projection."""
