"""Caffe's data on disk: LMDB and LevelDB databases of Datum records, their transforms, images, and ``ddl-caffe convert``."""
