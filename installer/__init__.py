"""Packaging: the frozen app's launcher, its first-launch runtime provisioning, and the smoke driver."""
