# Rewrites a CUDA kernel file (gpu/*.cu) into C++ that tests/cuda_emu runs on the CPU: a launch
# kernel<<<grid, block, shared, stream>>>(args) becomes kernel | ::emu::Config(grid, block,
# shared, stream)(args), and dynamic shared memory a pointer into the emulated block's.
s/<<<(.*)>>>\(/ | ::emu::Config(\1)(/g
s/extern __shared__ (__align__\([0-9]+\) )?([a-z ]*[a-z]) ([A-Za-z_0-9]+)\[\];/\2* \3 = ::emu::dynamic_shared<\2>();/
