ROUTES: list = []
