// Composite kernels: reduce (being written).
#include "tensor/ops.h"
