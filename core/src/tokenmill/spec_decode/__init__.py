"""Speculative decoding: proposers of draft tokens (a draft model, n-gram lookup) and how the target's
argmax verifies them. Imports no torch at package level (the scheduler uses ``verification``)."""
