/* The extension module engram_client.lookup.host._host_gather (module.c): its one visible symbol. */
#ifndef ENGRAM_ENGINE_MODULE_H
#define ENGRAM_ENGINE_MODULE_H
#include "common.h"

PyMODINIT_FUNC PyInit__host_gather(void);

#endif
