/* NodeBudget, the Python object of this process's slot in the node's gather budget (budget_type.c). */
#ifndef ENGRAM_ENGINE_BUDGET_TYPE_H
#define ENGRAM_ENGINE_BUDGET_TYPE_H
#include "common.h"
#include "budget.h"

typedef struct {
    PyObject_HEAD
    NodeBudget *b;
} NodeBudgetObject;

extern PyTypeObject NodeBudgetType;

int nb_add_to_module(PyObject *module);  /* the type and the budget's constants */

#endif
