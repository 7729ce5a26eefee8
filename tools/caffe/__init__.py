"""ddl-caffe's tools: the zoo job, benchmarks against plain PyTorch and real Caffe, and blob-for-blob parity with real Caffe."""
