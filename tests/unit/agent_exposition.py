"""A trimmed real agent exposition, as the rules service's telemetry mapping and scrape tests read it."""

U0 = "GPU-d2d2544c-689b-5087-bdbd-ea07f41b5806"
U1 = "GPU-a8c57d47-7419-54ce-a816-ce1029736ad6"
U2 = "GPU-0c1e0f55-1111-5222-8333-944455556666"

# From `gpumond agent --sim 3 --node-name gpu-node-07`, trimmed; then edited: GPU 0 runs a job and is
# power-capped, GPU 1 lacks die temperature and max SM clock (NVML "not supported"), GPU 2 is lost.
GOLDEN = f"""\
# HELP gpumond_build_info Build of the running agent; always 1.
# TYPE gpumond_build_info gauge
gpumond_build_info{{version="0.1.0"}} 1.0
# HELP gpumond_gpu_clocks_event_active 1 while the clock-event (throttle) reason is active, by reason.
# TYPE gpumond_gpu_clocks_event_active gauge
gpumond_gpu_clocks_event_active{{gpu="0",reason="gpu_idle",uuid="{U0}"}} 0.0
gpumond_gpu_clocks_event_active{{gpu="0",reason="sw_power_cap",uuid="{U0}"}} 1.0
gpumond_gpu_clocks_event_active{{gpu="0",reason="hw_slowdown",uuid="{U0}"}} 0.0
gpumond_gpu_clocks_event_active{{gpu="0",reason="sw_thermal_slowdown",uuid="{U0}"}} 0.0
gpumond_gpu_clocks_event_active{{gpu="0",reason="hw_thermal_slowdown",uuid="{U0}"}} 0.0
gpumond_gpu_clocks_event_active{{gpu="0",reason="hw_power_brake_slowdown",uuid="{U0}"}} 0.0
gpumond_gpu_clocks_event_active{{gpu="1",reason="sw_power_cap",uuid="{U1}"}} 0.0
gpumond_gpu_clocks_event_active{{gpu="1",reason="hw_slowdown",uuid="{U1}"}} 0.0
gpumond_gpu_clocks_event_active{{gpu="1",reason="sw_thermal_slowdown",uuid="{U1}"}} 0.0
gpumond_gpu_clocks_event_active{{gpu="1",reason="hw_thermal_slowdown",uuid="{U1}"}} 1.0
gpumond_gpu_clocks_event_active{{gpu="1",reason="hw_power_brake_slowdown",uuid="{U1}"}} 0.0
# HELP gpumond_gpu_energy_joules_total Energy consumed since the driver was loaded.
# TYPE gpumond_gpu_energy_joules_total counter
gpumond_gpu_energy_joules_total{{gpu="0",uuid="{U0}"}} 3312.168
gpumond_gpu_energy_joules_total{{gpu="1",uuid="{U1}"}} 3299.189
# HELP gpumond_gpu_info Identity of each GPU; always 1.
# TYPE gpumond_gpu_info gauge
gpumond_gpu_info{{gpu="0",hostname="gpu-node-07",name="NVIDIA H100 80GB HBM3",pci_bus_id="00000000:18:00.0",uuid="{U0}"}} 1.0
gpumond_gpu_info{{gpu="1",hostname="gpu-node-07",name="NVIDIA H100 80GB HBM3",pci_bus_id="00000000:2A:00.0",uuid="{U1}"}} 1.0
gpumond_gpu_info{{gpu="2",hostname="gpu-node-07",name="NVIDIA H100 80GB HBM3",pci_bus_id="00000000:3A:00.0",uuid="{U2}"}} 1.0
# HELP gpumond_gpu_job_info 1 for each job found running on the GPU.
# TYPE gpumond_gpu_job_info gauge
gpumond_gpu_job_info{{gpu="0",job="llama-70b-r3",uuid="{U0}"}} 1.0
gpumond_gpu_job_info{{gpu="0",job="eval-7",uuid="{U0}"}} 1.0
# HELP gpumond_gpu_power_limit_watts Power limit the driver enforces now (all constraints combined).
# TYPE gpumond_gpu_power_limit_watts gauge
gpumond_gpu_power_limit_watts{{gpu="0",uuid="{U0}"}} 700.0
gpumond_gpu_power_limit_watts{{gpu="1",uuid="{U1}"}} 650.0
# HELP gpumond_gpu_power_watts Board power draw averaged over ~1 s.
# TYPE gpumond_gpu_power_watts gauge
gpumond_gpu_power_watts{{gpu="0",uuid="{U0}"}} 662.24
gpumond_gpu_power_watts{{gpu="1",uuid="{U1}"}} 655.914
# HELP gpumond_gpu_sm_clock_hertz Current SM clock.
# TYPE gpumond_gpu_sm_clock_hertz gauge
gpumond_gpu_sm_clock_hertz{{gpu="0",uuid="{U0}"}} 1.755e+09
gpumond_gpu_sm_clock_hertz{{gpu="1",uuid="{U1}"}} 1.98e+09
# HELP gpumond_gpu_sm_clock_max_hertz Highest SM clock the board can run.
# TYPE gpumond_gpu_sm_clock_max_hertz gauge
gpumond_gpu_sm_clock_max_hertz{{gpu="0",uuid="{U0}"}} 1.98e+09
# HELP gpumond_gpu_temperature_celsius GPU die temperature.
# TYPE gpumond_gpu_temperature_celsius gauge
gpumond_gpu_temperature_celsius{{gpu="0",uuid="{U0}"}} 72.0
# HELP gpumond_gpu_up 1 when the GPU answered NVML this cycle, 0 when lost or failing.
# TYPE gpumond_gpu_up gauge
gpumond_gpu_up{{gpu="0",uuid="{U0}"}} 1.0
gpumond_gpu_up{{gpu="1",uuid="{U1}"}} 1.0
gpumond_gpu_up{{gpu="2",uuid="{U2}"}} 0.0
# HELP gpumond_gpu_utilization_ratio Fraction of the last sample period in which any kernel ran.
# TYPE gpumond_gpu_utilization_ratio gauge
gpumond_gpu_utilization_ratio{{gpu="0",uuid="{U0}"}} 0.94
gpumond_gpu_utilization_ratio{{gpu="1",uuid="{U1}"}} 0.31
# HELP gpumond_host_cpu_iowait_ratio Host CPU fraction spent waiting on I/O since the last sample.
# TYPE gpumond_host_cpu_iowait_ratio gauge
gpumond_host_cpu_iowait_ratio 0.125
# HELP gpumond_host_cpu_utilization_ratio Host CPU busy fraction (not idle, not iowait) since the last sample.
# TYPE gpumond_host_cpu_utilization_ratio gauge
gpumond_host_cpu_utilization_ratio 0.295
# HELP gpumond_host_disk_read_bytes_total Bytes read from whole physical disks.
# TYPE gpumond_host_disk_read_bytes_total counter
gpumond_host_disk_read_bytes_total 1.547396096e+09
# HELP gpumond_host_memory_used_bytes Host memory in use (total minus available).
# TYPE gpumond_host_memory_used_bytes gauge
gpumond_host_memory_used_bytes 5.8791936e+08
"""
