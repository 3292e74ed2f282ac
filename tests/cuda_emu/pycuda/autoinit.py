from cuda_emu import Device, init, make_current

init()
device = Device(0)
make_current()
