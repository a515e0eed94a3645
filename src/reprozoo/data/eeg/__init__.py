"""EEG datasets: motor imagery and sleep (simulated with an mne forward model, or PhysioNet through mne's
fetchers, or a user folder) and restricted sets read from a user folder (BIDS, DEAP, SEED)."""
