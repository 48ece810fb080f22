"""The stability mechanisms, each switchable: clipping, loss scaling, precision switching,
loss-spike detectors, recovery."""
