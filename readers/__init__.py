"""tf.data readers for recordprep outputs."""
