// CPU kernels: reduce (being written).
#include "tensor/cpu/loops.h"
