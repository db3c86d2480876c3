"""What the models share beyond one family: whether a model's neck or heads were built for the
levels its columnar backbone feeds (``consumers``)."""
from .consumers import ChannelMismatchError, check_consumers, check_model, consumer_problems

__all__ = ['ChannelMismatchError', 'check_consumers', 'check_model', 'consumer_problems']
