"""ECG-R1 in miniature: protocol-grounded ECG reports, modality dropout and evidence-reward RL."""
