"""Reading Kineto traces (ours and anyone's) into typed per-rank records."""
