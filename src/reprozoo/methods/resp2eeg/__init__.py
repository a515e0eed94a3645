"""Synthesising sleep EEG from respiration: breathing -> discrete multitaper-spectrogram tokens."""
