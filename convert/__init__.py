"""Record-level conversion logic: no Beam and no TensorFlow in here."""
