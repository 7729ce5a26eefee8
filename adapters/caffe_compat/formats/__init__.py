"""Caffe's file formats: caffe.proto and its message classes, prototxt and binary protos, .caffemodel and .solverstate, upgrades."""
