"""Cost: the resource ledger of what each island incarnation cost, and the cost guard."""
