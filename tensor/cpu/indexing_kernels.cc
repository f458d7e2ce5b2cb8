// CPU kernels: indexing (being written).
#include "tensor/cpu/loops.h"
