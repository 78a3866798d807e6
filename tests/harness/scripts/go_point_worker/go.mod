module fencecheck/go_point_worker

go 1.21
