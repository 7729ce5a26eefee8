"""The ``ddl-caffe`` command: its subcommands, Caffe-style log lines, IBM Caffe-DDL's options, memory reuse."""
