"""reduction: schedules, algorithms, their executor, the cost model and its calibration, bucket planning."""
