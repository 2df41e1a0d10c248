"""Operations the validator checks (issue 30): each one an object implementing `interface.Operation`."""
