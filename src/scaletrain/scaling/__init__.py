"""After training: scaling sweeps, MFU, 1-vs-N parity and a prediction for larger clusters."""
