"""Caffe's solvers: the step loop, update rules, learning-rate policies, ranks averaging gradients, elastic training."""
