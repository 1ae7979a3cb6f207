"""The Beam conversion job."""
