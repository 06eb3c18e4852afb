/* PLACEHOLDER (being written): double binary tree allreduce. */
#include "algorithms.h"
