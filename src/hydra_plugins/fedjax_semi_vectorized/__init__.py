"""fedjax-semi's Hydra launcher `hydra/launcher=vectorized` (fedjax_semi.vectorized): the jobs of
a multirun that differ only in seeds and traced keys run as one compiled program."""
