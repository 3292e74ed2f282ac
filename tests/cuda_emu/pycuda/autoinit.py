from cuda_emu import Device, init

init()
device = Device(0)
