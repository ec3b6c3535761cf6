"""``label_flip``: a malicious client trains on labels y → C − 1 − y (data poisoning)."""

from hetfed.engine.attacks import ClientAttack, register

register(ClientAttack("label_flip", "data poisoning: labels y → C − 1 − y",
                      poison_data=lambda x, y, samples, params: (x, samples.n_classes - 1 - y)))
