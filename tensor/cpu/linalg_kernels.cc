// CPU kernels: linalg (being written).
#include "tensor/cpu/loops.h"
