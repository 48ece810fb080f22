"""The live-control channel: signed commands into a running job."""
