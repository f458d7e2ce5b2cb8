// CPU kernels: elementwise (being written).
#include "tensor/cpu/loops.h"
