/* SignalTestSlot (test_slot.c): a signalled slot whose stream the caller plays, for CPU-only tests. */
#ifndef ENGRAM_ENGINE_TEST_SLOT_H
#define ENGRAM_ENGINE_TEST_SLOT_H
#include "common.h"

extern PyTypeObject SignalTestSlotType;

#endif
