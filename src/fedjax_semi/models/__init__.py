"""Models: vmap/scan-friendly layers, the flax architectures and the model registry."""

from fedjax_semi.models.architectures import CNN, MLP, ResNet9
from fedjax_semi.models.layers import Conv, Dropout, avg_pool, global_max_pool, max_pool
from fedjax_semi.models.zoo import MODELS, Model, make_model, model_names, num_params

__all__ = [
    "CNN",
    "MLP",
    "MODELS",
    "Conv",
    "Dropout",
    "Model",
    "ResNet9",
    "avg_pool",
    "global_max_pool",
    "make_model",
    "max_pool",
    "model_names",
    "num_params",
]
